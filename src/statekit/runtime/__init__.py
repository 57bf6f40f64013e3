"""statekit.runtime"""
