"""The transformer example: a tiny vision transformer on the bundled 8x8 digits."""
