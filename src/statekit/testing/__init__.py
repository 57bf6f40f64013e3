"""statekit.testing"""
