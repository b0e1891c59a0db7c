"""Helpers shared by test modules: test modules import from here, never from each other."""
