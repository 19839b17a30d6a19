"""The agent runtime: the loop, model clients and the tool host."""
