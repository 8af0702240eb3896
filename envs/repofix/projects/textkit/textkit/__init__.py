"""textkit: small text utilities."""

from textkit.layout import center, truncate, wrap
from textkit.words import (
    capitalize_words,
    is_palindrome,
    levenshtein,
    rle_decode,
    rle_encode,
    slugify,
    word_count,
)

__all__ = [
    "capitalize_words",
    "center",
    "is_palindrome",
    "levenshtein",
    "rle_decode",
    "rle_encode",
    "slugify",
    "truncate",
    "word_count",
    "wrap",
]
