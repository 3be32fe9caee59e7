"""sandforge inside agent frameworks (issue 40): smolagents, LangChain, the OpenAI Agents SDK, pydantic-ai.

One room above everything else (the runtime and the sandbox never import it), one small interface:
:class:`~sandforge.integrations.core.SandforgeTools` offers a :class:`~sandforge.runtime.agent.Workspace` as a
code-execution tool plus its role methods (typed from their contracts); each framework's module turns that
into the framework's own tools and imports the framework, which only its extra installs::

    from sandforge.integrations import SandforgeTools
    from sandforge.integrations.langchain import langchain_tools          # sandforge[langchain]
    from sandforge.integrations.smolagents import code_agent               # sandforge[smolagents]
    from sandforge.integrations.openai_agents import function_tools       # sandforge[openai-agents]
    from sandforge.integrations.pydantic_ai import sandforge_toolset       # sandforge[pydantic-ai]

See docs/frameworks.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandforge.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from sandforge.integrations.core import SandforgeTools, ToolAnswer

__all__ = ["SandforgeTools", "ToolAnswer"]

__getattr__, __dir__ = lazy_exports(
    __name__, {"SandforgeTools": "sandforge.integrations.core", "ToolAnswer": "sandforge.integrations.core"}
)
