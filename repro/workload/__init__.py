"""What the sessions say: scripted scenarios, recorded traces, their conversion, and the tool sandbox."""
