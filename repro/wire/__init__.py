"""The wire: HTTP transport, one streamed chat-completion turn, and the raw text a response carries."""
