"""statekit.checkpoint"""
