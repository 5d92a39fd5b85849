def greet(name):
    return f"Helo, {name}!"


if __name__ == "__main__":
    print(greet("world"))
