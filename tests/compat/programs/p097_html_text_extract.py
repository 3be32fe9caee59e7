# args: ["<html><head><title>T</title><script>var x=1;</script></head><body><h1>Hi</h1><p>Some <b>bold</b> text.</p></body></html>"]
from html.parser import HTMLParser

class TextExtractor(HTMLParser):
    def __init__(self):
        super().__init__()
        self.parts = []
        self.skip = False
        self.headings = []
        self.current = None

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip = True
        self.current = tag

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = False
        self.current = None

    def handle_data(self, data):
        if not self.skip and data.strip():
            self.parts.append(data.strip())
            if self.current == "h1":
                self.headings.append(data.strip())

p = TextExtractor()
p.feed(args[0])
p.close()
return {"text": " ".join(p.parts), "headings": p.headings}
