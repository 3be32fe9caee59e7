# args: [["page1", "page2", "page3"]]
import asyncio


class Client:
    def __init__(self, pages):
        self._pages = pages
        self.closed = False

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        self.closed = True
        return False

    async def pages(self):
        for page in self._pages:
            await asyncio.sleep(0)
            yield page.upper()


async def main(pages):
    async with Client(pages) as client:
        collected = [p async for p in client.pages()]
    return {"pages": collected, "closed": client.closed}


return asyncio.run(main(args[0]))
