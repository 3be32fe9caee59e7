# args: [42]
n = args[0]
return {"bin": bin(n), "hex": hex(n), "oct": oct(n), "bits": bin(n).count("1"), "back": int(bin(n), 2)}
