# args: ["Hello, World!", 3]
def shift_char(c, k):
    if c.isupper():
        return chr((ord(c) - ord("A") + k) % 26 + ord("A"))
    if c.islower():
        return chr((ord(c) - ord("a") + k) % 26 + ord("a"))
    return c

text, key = args
encoded = "".join(shift_char(c, key) for c in text)
decoded = "".join(shift_char(c, -key) for c in encoded)
return [encoded, decoded]
