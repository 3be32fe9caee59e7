# args: ["the quick brown fox jumps over the lazy dog the end"]
class WordIndex:
    def __init__(self, text):
        self._text = text
        self._cache = {}

    def _tokenize(self):
        if "tokens" not in self._cache:
            self._cache["tokens"] = self._text.lower().split()
        return self._cache["tokens"]

    def positions(self, word):
        return [i for i, token in enumerate(self._tokenize()) if token == word]

    def stats(self):
        tokens = self._tokenize()
        return {"words": len(tokens), "unique": len(set(tokens)), "cached": sorted(self._cache)}


index = WordIndex(args[0])
return [index.positions("the"), index.stats()]
