# args: ["<html><body><a href=\"/a\">A</a><p>x</p><a href=\"https://e.com/b\">B</a></body></html>"]
from html.parser import HTMLParser

class LinkParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            for name, value in attrs:
                if name == "href":
                    self.links.append(value)

parser = LinkParser()
parser.feed(args[0])
return parser.links
