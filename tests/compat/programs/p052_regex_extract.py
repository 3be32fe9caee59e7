# args: ["Contact: john@example.com, jane.doe@test.org; phone 555-1234 or 555-9876."]
import re

text = args[0]
emails = re.findall(r"[\w.]+@[\w.]+\.\w+", text)
phones = re.findall(r"\d{3}-\d{4}", text)
m = re.search(r"(\w+)@(\w+)", text)
return {"emails": emails, "phones": phones, "first_user": m.group(1), "domain": m.group(2)}
