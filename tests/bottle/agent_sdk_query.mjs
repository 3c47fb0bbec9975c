// One query through the TypeScript Agent SDK, its Claude Code the executable given: each message the SDK
// yields as a JSON line on standard output, what the executable writes on standard error on this one's. Its environment (and with it the drop-in's) is this process's own.
// Usage: node agent_sdk_query.mjs SDK_PACKAGE_FOLDER CLAUDE_EXECUTABLE PROMPT
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [sdkFolder, executable, prompt] = process.argv.slice(2);
const { query } = await import(pathToFileURL(join(sdkFolder, "sdk.mjs")).href);

for await (const message of query({
  prompt,
  options: { pathToClaudeCodeExecutable: executable, cwd: process.cwd(), stderr: (data) => process.stderr.write(data) },
})) {
  process.stdout.write(JSON.stringify(message) + "\n");
}
