# args: ["Crème Brûlée à la mode"]
import unicodedata

def strip_accents(s: str) -> str:
    nfkd = unicodedata.normalize("NFKD", s)
    return "".join(c for c in nfkd if not unicodedata.combining(c))

return {"plain": strip_accents(args[0]), "category": unicodedata.category("é"), "name": unicodedata.name("é")}
