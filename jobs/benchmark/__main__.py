from jobs.benchmark import main

main()
