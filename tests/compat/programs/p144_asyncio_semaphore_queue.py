# args: [[5, 3, 8, 1, 9, 2]]
import asyncio


async def worker(name, queue, results, limit):
    while True:
        item = await queue.get()
        async with limit:
            await asyncio.sleep(0)
            results.append((name, item * item))
        queue.task_done()


async def main(items):
    queue = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    results = []
    limit = asyncio.Semaphore(2)
    workers = [asyncio.create_task(worker(f"w{i}", queue, results, limit)) for i in range(3)]
    await queue.join()
    for w in workers:
        w.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return sorted(square for _, square in results)


return asyncio.run(main(args[0]))
