# args: [["alice@example.com", "bob@example.com"]]
import uuid

records = []
for email in args[0]:
    stable = uuid.uuid5(uuid.NAMESPACE_URL, f"mailto:{email}")
    request_id = uuid.uuid4()
    records.append({"email": email, "id": str(stable), "id_version": stable.version,
                    "request_id_ok": len(request_id.hex) == 32 and request_id.version == 4})
return records
