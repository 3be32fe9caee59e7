# args: [1234567.891, 0.4567, 42]
big, ratio, n = args
return {
    "thousands": f"{big:,.2f}",
    "percent": f"{ratio:.1%}",
    "padded": f"{n:05d}",
    "sci": f"{big:.3e}",
    "old": "%s has %d items (%.1f%%)" % ("cart", n, ratio * 100),
    "pos": "{0} {1} {0}".format("x", "y"),
    "repr": f"{'quote'!r}",
    "center": f"{'mid':*^9}",
}
