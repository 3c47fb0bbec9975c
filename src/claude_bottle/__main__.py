from claude_bottle.cli import main

main()
