# args: ["<catalog><book id=\"1\"><title>Dune</title><price>9.99</price></book><book id=\"2\"><title>Emma</title><price>4.50</price></book></catalog>"]
import xml.etree.ElementTree as ET

root = ET.fromstring(args[0])
books = []
for book in root.findall("book"):
    books.append({
        "id": int(book.get("id")),
        "title": book.find("title").text,
        "price": float(book.find("price").text),
    })
books.sort(key=lambda b: b["price"])
return books
