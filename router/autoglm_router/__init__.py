"""The front door: a mode- and session-aware router in front of AutoGLM runtime replicas."""
