# args: [["Racecar", "hello", "A man, a plan, a canal: Panama", "abc"]]
def is_palindrome(s: str) -> bool:
    cleaned = "".join(ch.lower() for ch in s if ch.isalnum())
    return cleaned == cleaned[::-1]

return {s: is_palindrome(s) for s in args[0]}
