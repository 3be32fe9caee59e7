# args: [[200, 404, 500, 301, 418]]
def describe(code):
    match code:
        case 200 | 201:
            return "ok"
        case 301 | 302:
            return "redirect"
        case 404:
            return "not found"
        case c if 500 <= c < 600:
            return "server error"
        case _:
            return "other"

return [describe(c) for c in args[0]]
