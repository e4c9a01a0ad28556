"""Enqueueing: the public API, validation and storable bounds, prepared requests, key hashing and recipes, eager mode."""
