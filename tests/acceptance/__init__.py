"""Black-box acceptance checks of issues 13, 14 and 16 (review pass)."""
