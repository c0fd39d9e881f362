"""Local stack: scripts and small tools that start the real servers on 127.0.0.1."""
