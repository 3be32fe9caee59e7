# args: ["1990-08-15", "2024-03-10"]
from datetime import datetime

def calculate_age(birth: str, today: str) -> int:
    b = datetime.strptime(birth, "%Y-%m-%d").date()
    t = datetime.strptime(today, "%Y-%m-%d").date()
    age = t.year - b.year
    if (t.month, t.day) < (b.month, b.day):
        age -= 1
    return age

return calculate_age(args[0], args[1])
