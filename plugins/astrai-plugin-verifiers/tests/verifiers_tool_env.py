"""A verifiers tool environment for the tests: each task offers an ``add`` tool (an MCP
server verifiers launches with ``python -m verifiers_tool_env``) and its rubric rewards the
right sum and the use of the tool."""

from __future__ import annotations

import verifiers.v1 as vf


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class SumData(vf.TaskData):
    answer: str


class SumTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class SumTask(vf.Task[SumData, vf.State, SumTaskConfig]):
    @classmethod
    def toolsets(cls, config: SumTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == self.data.answer)


class SumConfig(vf.TasksetConfig):
    task: SumTaskConfig = SumTaskConfig()


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self) -> list[SumTask]:
        pairs = [(2, 3), (4, 3)]
        return [SumTask(SumData(idx=i, prompt=f"{a}+{b}=", answer=str(a + b)), self.config.task)
                for i, (a, b) in enumerate(pairs)]


def sums() -> SumTaskset:
    return SumTaskset(SumConfig(id=__name__))


__all__ = ["SumTaskset"]

if __name__ == "__main__":
    AddToolset.run()
