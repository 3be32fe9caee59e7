# args: [[0.01, 5, 0.02]]
import asyncio


async def slow(delay):
    await asyncio.sleep(delay)
    return delay


async def main(delays):
    out = []
    for delay in delays:
        try:
            out.append(await asyncio.wait_for(slow(delay), timeout=0.5))
        except asyncio.TimeoutError:
            out.append("timeout")
    return out


return asyncio.run(main(args[0]))
