# args: ["<script>alert('x') & \"y\"</script>"]
import html

escaped = html.escape(args[0])
return {"escaped": escaped, "back": html.unescape(escaped) == args[0]}
