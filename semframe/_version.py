"""The version of semframe (one place: the package metadata reads it too)."""

__version__ = "0.1.0"
