# args: ["The quick brown fox jumps over the lazy dog and keeps running far away.", 20]
import textwrap

text, width = args
wrapped = textwrap.wrap(text, width=width)
return {"lines": wrapped, "filled": textwrap.fill(text, width=width), "short": textwrap.shorten(text, width=30)}
