"""Where work runs: Ray connection, resources, placement, and which node this process is on."""
