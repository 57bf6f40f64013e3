"""statekit.backends"""
