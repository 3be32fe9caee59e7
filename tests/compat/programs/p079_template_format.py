# kwargs: {"name": "Dana", "item": "laptop", "days": 3}
template = "Hello {name}, your {item} will arrive in {days} days."
message = template.format(**kwargs)
alt = "Dear {name}: {item}".format_map(kwargs)
return [message, alt]
