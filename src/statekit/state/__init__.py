"""statekit.state"""
