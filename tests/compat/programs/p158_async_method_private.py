# args: [["a", "b", "a", "c"]]
import asyncio


class RateLimitedCache:
    def __init__(self):
        self._store = {}
        self._hits = 0
        self._lock = asyncio.Lock()

    async def _load(self, key):
        await asyncio.sleep(0)
        return key.upper() * 2

    async def get(self, key):
        async with self._lock:
            if key in self._store:
                self._hits += 1
                return self._store[key]
            value = await self._load(key)
            self._store[key] = value
            return value


async def main(keys):
    cache = RateLimitedCache()
    values = await asyncio.gather(*(cache.get(k) for k in keys))
    return {"values": values, "hits": cache._hits, "size": len(cache._store)}


return asyncio.run(main(args[0]))
