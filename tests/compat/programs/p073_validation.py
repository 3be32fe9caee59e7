# kwargs: {"email": "bob@example", "age": "17", "name": ""}
import re

errors = {}
email = kwargs.get("email", "")
if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-zA-Z]{2,}", email):
    errors["email"] = "invalid email"
try:
    age = int(kwargs.get("age", ""))
    if age < 18:
        errors["age"] = "must be at least 18"
except ValueError:
    errors["age"] = "not a number"
if not kwargs.get("name", "").strip():
    errors["name"] = "required"
return {"valid": not errors, "errors": errors}
