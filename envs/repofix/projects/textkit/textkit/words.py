"""Word-level helpers and two classic string algorithms."""


def slugify(text: str) -> str:
    """Lower-case words of letters and digits joined by single dashes."""
    out: list[str] = []
    word = ""
    for ch in text.lower():
        if ch.isalnum():
            word += ch
        elif word:
            out.append(word)
            word = ""
    if word:
        out.append(word)
    return "-".join(out)


def word_count(text: str) -> dict[str, int]:
    """How often each lower-cased word occurs (punctuation at word edges is ignored)."""
    counts: dict[str, int] = {}
    for raw in text.split():
        word = raw.strip(".,;:!?\"'()").lower()
        if len(word) > 0:
            counts[word] = counts.get(word, 0) + 1
    return counts


def capitalize_words(text: str) -> str:
    """Each space-separated word with its first letter upper-cased and the rest unchanged."""
    return " ".join(w[:1].upper() + w[1:] for w in text.split(" "))


def is_palindrome(text: str) -> bool:
    """True if the letters and digits of ``text`` read the same both ways (case-insensitive)."""
    chars = [c.lower() for c in text if c.isalnum()]
    i, j = 0, len(chars) - 1
    while i < j:
        if chars[i] != chars[j]:
            return False
        i += 1
        j -= 1
    return True


def rle_encode(text: str) -> list[tuple[str, int]]:
    """Run-length encoding: ``"aab"`` -> ``[("a", 2), ("b", 1)]``."""
    runs: list[tuple[str, int]] = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs


def rle_decode(runs: list[tuple[str, int]]) -> str:
    """Inverse of ``rle_encode``; counts must be positive."""
    parts: list[str] = []
    for ch, n in runs:
        if n < 1:
            raise ValueError(f"run count must be positive, got {n}")
        parts.append(ch * n)
    return "".join(parts)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1)."""
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
        prev = cur
    return prev[len(b)]
