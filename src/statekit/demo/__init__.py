"""Runnable demos."""
