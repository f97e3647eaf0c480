"""Packaged data: production traces (see README.md here for their sources and licence)."""
