// E2B's official JS SDK (`e2b`, `@e2b/code-interpreter`, pinned in package.json) against
// `sandbox-workspace dev`: the program tests/api/test_e2b_sdk.py runs with the Python SDK,
// written for E2B's cloud and configured only by E2B's environment variables. Run by
// tests/clients/test_e2b_js_sdk.py; prints one JSON report line for it to judge.
import { Sandbox } from "@e2b/code-interpreter";

const report = {};
const sbx = await Sandbox.create();
report.id = sbx.sandboxId;
await sbx.files.write("/home/user/hello.txt", "hello from e2b");
await sbx.files.write("notes/relative.txt", "relative");
report.listed = (await sbx.files.list("/home/user")).map((e) => e.name).sort();
report.read = await sbx.files.read("hello.txt");
report.nested = await sbx.files.read("/home/user/notes/relative.txt");
const streamed = [];
const cmd = await sbx.commands.run("echo first; sleep 0.3; echo oops >&2; cat hello.txt", {
  onStdout: (data) => streamed.push(data),
});
report.cmd = [cmd.exitCode, cmd.stdout, cmd.stderr, streamed];
await sbx.runCode("counter = 41");
const second = await sbx.runCode("counter + 1");
report.state = [second.text, second.executionCount];
const plot = await sbx.runCode(
  "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n" +
    "plt.plot([1, 3, 2])\nplt.show()",
);
report.png = plot.results.length ? plot.results[0].png.slice(0, 12) : null;
try {
  await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} });
  report.unsupported = "answered";
} catch (e) {
  report.unsupported = `${e.name}: ${e.message}`;
}
try {
  await sbx.files.read("/etc/passwd");
  report.outside = "answered";
} catch (e) {
  report.outside = `${e.name}: ${e.message}`;
}
report.running_before_kill = (await Sandbox.list().nextItems()).map((s) => s.sandboxId);
await sbx.kill();
report.killed = !(await Sandbox.list().nextItems()).some((s) => s.sandboxId === report.id);
console.log(JSON.stringify(report));
