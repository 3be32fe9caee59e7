# args: [[{"type": "text", "value": "hi"}, {"type": "number", "value": 4}, {"type": "list", "value": [1, 2]}, {"type": "blob", "value": null}]]
class Renderer:
    def render(self, node):
        method = getattr(self, f"render_{node['type']}", self.render_unknown)
        return method(node["value"])

    def render_text(self, value):
        return f"<p>{value}</p>"

    def render_number(self, value):
        return f"<b>{value}</b>"

    def render_list(self, value):
        return "<ul>" + "".join(f"<li>{v}</li>" for v in value) + "</ul>"

    def render_unknown(self, value):
        return f"<!-- unknown: {value!r} -->"


r = Renderer()
return [r.render(node) for node in args[0]]
