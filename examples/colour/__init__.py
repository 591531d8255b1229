"""The colour example: 16x16 colour digits whose class depends on a fine chroma mosaic."""
