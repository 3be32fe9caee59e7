# args: [100, "km", "mi"]
CONVERSIONS = {
    ("km", "mi"): 0.621371,
    ("mi", "km"): 1.609344,
    ("kg", "lb"): 2.20462,
    ("lb", "kg"): 0.453592,
}

value, src, dst = args
if src == dst:
    return value
factor = CONVERSIONS.get((src, dst))
if factor is None:
    return Outcome.error("unsupported_conversion", f"cannot convert {src} to {dst}")
return round(value * factor, 4)
