# args: [["ok", "fail", "ok"]]
import logging

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logger = logging.getLogger("p140.jobs")
done = []
for job in args[0]:
    if job == "fail":
        logger.error("job %s failed", job)
        continue
    logger.info("job %s done", job)
    done.append(job)
return {"done": done, "level": logging.getLevelName(logger.getEffectiveLevel())}
