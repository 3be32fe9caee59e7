# args: [["alpha", "beta", "gamma"]]
import asyncio


async def fetch_status(name, delay):
    await asyncio.sleep(delay)
    return {"service": name, "status": "up" if name != "beta" else "degraded"}


async def main(names):
    tasks = [fetch_status(name, 0.01 * (len(names) - i)) for i, name in enumerate(names)]
    return await asyncio.gather(*tasks)


return asyncio.run(main(args[0]))
