"""Laying out text in fixed widths."""


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap: lines of at most ``width`` characters; a longer word gets its own line."""
    if width < 1:
        raise ValueError("width must be at least 1")
    lines: list[str] = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current += " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def truncate(text: str, limit: int, suffix: str = "...") -> str:
    """``text`` cut to at most ``limit`` characters, ending in ``suffix`` when it was cut."""
    if limit < len(suffix):
        raise ValueError("limit is shorter than the suffix")
    if len(text) <= limit:
        return text
    return text[: limit - len(suffix)] + suffix


def center(text: str, width: int, fill: str = " ") -> str:
    """``text`` padded with ``fill`` on both sides to ``width``; the extra character goes right."""
    if len(fill) != 1:
        raise ValueError("fill must be a single character")
    if len(text) >= width:
        return text
    total = width - len(text)
    left = total // 2
    right = total - left
    return fill * left + text + fill * right
