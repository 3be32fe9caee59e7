# args: [{"retries": "5", "timeout": "2.5", "verbose": "yes", "unknown": "x"}]
class Settings:
    retries = 3
    timeout = 1.0
    verbose = False

    def apply(self, overrides):
        skipped = []
        for key, raw in overrides.items():
            if not hasattr(self, key):
                skipped.append(key)
                continue
            current = getattr(self, key)
            if isinstance(current, bool):
                value = raw.lower() in ("1", "yes", "true")
            else:
                value = type(current)(raw)
            setattr(self, key, value)
        return skipped


s = Settings()
skipped = s.apply(args[0])
return {"retries": s.retries, "timeout": s.timeout, "verbose": s.verbose, "skipped": skipped}
