"""The artifact-health dashboard (issue 21): server-rendered pages at ``/dashboard`` with JSON twins at
``/v1/dashboard``, served by ``sandforge serve`` and locally by ``sandforge dashboard``. See docs/dashboard.md."""
