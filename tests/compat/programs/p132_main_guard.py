# args: ["a,b,c"]
def split_fields(text):
    return [part.strip() for part in text.split(",") if part.strip()]


def main():
    print(split_fields("x, y"))


if __name__ == "__main__":
    main()

return {"fields": split_fields(args[0]), "module": __name__}
