# args: [{"title": "Report", "items": ["alpha", "beta"]}]
import xml.etree.ElementTree as ET

spec = args[0]
root = ET.Element("doc")
title = ET.SubElement(root, "title")
title.text = spec["title"]
items = ET.SubElement(root, "items")
for i, name in enumerate(spec["items"]):
    el = ET.SubElement(items, "item")
    el.set("index", str(i))
    el.text = name
return ET.tostring(root, encoding="unicode")
