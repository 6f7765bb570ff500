from profilednn.cli import main

main()
