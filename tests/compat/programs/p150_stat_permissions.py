# args: [[33188, 16877, 33261, 41471]]
import stat

out = []
for mode in args[0]:
    out.append({
        "mode": stat.filemode(mode),
        "dir": stat.S_ISDIR(mode),
        "link": stat.S_ISLNK(mode),
        "exec": bool(mode & stat.S_IXUSR),
    })
return out
