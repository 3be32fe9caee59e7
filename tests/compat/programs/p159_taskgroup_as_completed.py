# args: [[0.25, 0.05, 0.15]]
import asyncio


async def job(i, delay):
    await asyncio.sleep(delay)
    return i


async def main(delays):
    finished = []
    for coro in asyncio.as_completed([job(i, d) for i, d in enumerate(delays)]):
        finished.append(await coro)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(job(i, 0)) for i in range(3)]
    return {"completion_order": finished, "group": [t.result() for t in tasks]}


return asyncio.run(main(args[0]))
